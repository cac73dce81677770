"""Public functions: validate, normalize layouts, pick the path, hand the problem to a planner."""
