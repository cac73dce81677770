"""Argument checks the subcommands share: positive integers and an SM count the target GPU has."""

from __future__ import annotations

import argparse

import torch

from deepgemm.kernels.common.device import DEFAULT_NUM_SMS


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (argparse names the option and exits 2 otherwise)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def local_sm_limit() -> tuple[int, str]:
    """The most SMs a kernel can be planned for here and what has that many: this GPU (all its SMs, before any
    DEEPGEMM_NUM_SMS cap), else the largest Hopper part."""
    if torch.cuda.is_available():
        index = torch.cuda.current_device()
        return torch.cuda.get_device_properties(index).multi_processor_count, torch.cuda.get_device_name(index)
    return DEFAULT_NUM_SMS, "the largest Hopper part, without a GPU here"


def check_num_sms(num_sms: int | None, most: int, what: str) -> None:
    """ValueError naming --num-sms unless it is None or from 1 to `most` (the SM count of `what`)."""
    if num_sms is None:
        return
    if isinstance(num_sms, bool) or not isinstance(num_sms, int) or not 1 <= num_sms <= most:
        raise ValueError(f"argument --num-sms: must be from 1 to {most} (the SMs of {what}), got {num_sms!r}")
