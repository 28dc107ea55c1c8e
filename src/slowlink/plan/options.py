"""From the strings of `slowlink plan`'s options to a PlanRequest: each option parsed and checked
where it is read, so that an error names the option and the fix (units.py)."""

from dataclasses import dataclass

from ..errors import ConfigError
from . import units
from .model import Cluster, layers_for, step_time_from_flops
from .request import PlanRequest


@dataclass(frozen=True, kw_only=True)
class PlanOptions:
    """The command line's options, as typed; None where left out."""

    params: str
    bandwidth: str
    workers: str = "8"
    step_time: str | None = None
    layers: str | None = None
    latency: str = "0"
    sync_every: str = "100"
    fragments: str | None = None
    overlap_steps: str = "1"
    tokens: str | None = None
    batch_tokens: str | None = None
    chips: str = "1"
    peak_flops: str = "989e12"
    mfu: str = "0.4"
    target: str = "90%"
    model: str = "timeline"


def request_from_options(o: PlanOptions) -> PlanRequest:
    params = units.parse_count("--params", o.params)
    layers = units.parse_int("--layers", o.layers) if o.layers is not None else layers_for(params)
    batch = units.parse_count("--batch-tokens", o.batch_tokens, example="32k") if o.batch_tokens else None
    if o.step_time is not None:
        step_time, note = units.parse_duration("--step-time", o.step_time), "given"
    elif batch is not None:
        chips = units.parse_count("--chips", o.chips, example="8")
        peak = units.parse_count("--peak-flops", o.peak_flops, example="989e12")
        mfu = units.parse_fraction("--mfu", o.mfu)
        step_time = step_time_from_flops(params, batch, chips, peak, mfu)
        note = f"6·N·{batch:.0f} tokens / ({chips:g} chips · {peak:.3g} FLOP/s · {mfu:.0%} MFU)"
    else:
        raise ConfigError(
            "give --step-time (compute seconds a step, e.g. --step-time 2.4), or --batch-tokens to derive "
            "it from FLOPs with --chips, --peak-flops and --mfu"
        )
    cluster = Cluster(
        params=params,
        layers=layers,
        step_time=step_time,
        workers=units.parse_int("--workers", o.workers, low=2),
        latency=units.parse_duration("--latency", o.latency, allow_zero=True),
    )
    return PlanRequest(
        cluster=cluster,
        bandwidths=tuple(units.parse_bandwidths("--bandwidth", o.bandwidth)),
        sync_every=tuple(units.parse_int_list("--sync-every", o.sync_every)),
        fragments=units.parse_int("--fragments", o.fragments) if o.fragments is not None else None,
        overlap_steps=units.parse_int("--overlap-steps", o.overlap_steps, low=0),
        tokens=units.parse_count("--tokens", o.tokens, example="1e12") if o.tokens else None,
        batch_tokens=batch,
        target=units.parse_fraction("--target", o.target),
        model=o.model,
        step_time_note=note,
    )
