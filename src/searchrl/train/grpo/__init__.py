"""The GRPO trainer (trainer) and what it works on and calls: its records (state), building and
resuming them (setup), the update (update, ptx), keep-best (selection), checkpoints."""
