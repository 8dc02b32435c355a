"""The planner service (DESIGN.md §7): an app factory (`app.create_app`), one router per resource."""
