"""The parts the engine composes: verifiers, drafters, draft-length policies, verification paths, the probe."""
