"""The trainer's error, in its own module so the loop (`trainer.py`) and the modules it calls
(`selection.py`) can all raise it without importing each other."""


class TrainingError(RuntimeError):
    """Training cannot continue (too many non-finite steps, bad inputs); names the setting."""
