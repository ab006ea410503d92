"""The cold start: the SFT policy GRPO starts from (build), its SFT trainer (sft) and scripted
demonstrations (demos)."""
