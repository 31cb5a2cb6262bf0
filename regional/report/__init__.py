"""The job report: `summary` builds it from a checkpoint root (events, checkpoints, retention, as
Arrow tables) and `html` renders it as one self-contained page (`regional inspect ROOT report`)."""
