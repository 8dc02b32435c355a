"""Discrete-event simulator, the policies it replays, and the metrics it reports."""
