"""Channels over torch.distributed process groups (gloo on CPUs, NCCL on GPUs, under torchrun): DiLoCo over a
group (`AllReduce`, allreduce.py), islands (island.py: many ranks as one node of a mailbox run), DeMo's
all-gather (gather.py), and the quantized all-reduce (quantized.py)."""

from .allreduce import AllReduce
from .quantized import quantized_all_reduce

__all__ = ["AllReduce", "quantized_all_reduce"]
