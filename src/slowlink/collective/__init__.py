"""Channels over torch.distributed process groups (gloo on CPUs, NCCL on GPUs, under torchrun)."""
