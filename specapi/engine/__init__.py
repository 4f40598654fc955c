"""One request's life: the plan, the round loop, the target alone, the output."""
