"""The one copy of every rule both drivers (the simulator and the live service) use."""
