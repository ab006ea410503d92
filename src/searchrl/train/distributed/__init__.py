"""The ranks: DeepSpeed set up in each (deepspeed_setup) and started through DeepSpeed's
launcher (launcher, hostfile)."""
