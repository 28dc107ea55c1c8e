"""The package's shape: layers import only the layers below them (DESIGN.md), and the public surface
is pinned, so that a change to either is a deliberate one."""

import ast
from pathlib import Path

import slowlink as sl

PACKAGE = Path(sl.__file__).parent

# DESIGN.md's layers, bottom first. errors.py, arrays.py, clock.py and events.py are shared vocabulary, below
# everything. The engine (the driver and the channel interface) sits on the methods; the mailbox channel
# (protocol), the collective channel and the simulator each sit on the engine, so none copies the round logic.
# plan (the utilization planner) is pure arithmetic: it needs only errors, and cli imports it.
# optim (DeMo, an optimizer that exchanges in step()) sits on the exchanges of engine and collective; the
# simulator runs it (sim/demo.py).
# integrations (the Hugging Face Trainer callback) drives a session and its checkpoints.
LAYERS = ["errors", "arrays", "clock", "events", "metrics", "plan", "frameworks", "mailbox", "wire", "algorithms",
          "engine", "protocol", "collective", "optim", "sim", "session", "align", "checkpoint", "integrations", "ops", "demo", "bench",
          "cli"]  # fmt: skip


def layer_of(module: str) -> str:
    return module.split(".")[0]


def imported_slowlink_modules(path: Path) -> set[str]:
    """slowlink modules a file imports, as dotted names relative to the package ("protocol.run", ...)."""
    here = path.relative_to(PACKAGE).with_suffix("").parts
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = (
                list(here[: len(here) - node.level])
                if path.name != "__init__.py"
                else list(here[: len(here) - node.level + 1])
            )
            target = base + (node.module.split(".") if node.module else [])
            if target:
                found.add(".".join(target))
            else:
                found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("slowlink."):
            found.add(node.module.removeprefix("slowlink."))
    return found


def test_every_module_imports_only_its_own_layer_and_the_layers_below():
    violations = []
    for path in sorted(PACKAGE.rglob("*.py")):
        own = layer_of(".".join(path.relative_to(PACKAGE).with_suffix("").parts))
        if own == "__init__":
            continue  # the package's front door re-exports from every layer
        assert own in LAYERS, f"{path} is in no layer of DESIGN.md"
        for module in imported_slowlink_modules(path):
            other = layer_of(module)
            if other in LAYERS and LAYERS.index(other) > LAYERS.index(own):
                violations.append(f"{path.relative_to(PACKAGE)} ({own}) imports {module} ({other})")
    assert not violations, "\n".join(violations)


def test_the_public_surface_is_exactly_this():
    assert sorted(sl.__all__) == [
        "BalancedBytes", "ConfigError", "ContributionRefused", "DeMo", "DiLoCo", "DirMailbox", "Event", "GossipDiLoCo", "MailboxError", "MemoryMailbox",
        "NoLoCo", "NormClippedMean", "PayloadError", "RDA", "RunConfigMismatch", "S3Mailbox", "SchemaMismatch", "Session",
        "SessionStateError", "SessionStats", "SlowlinkError", "Strided", "TopK", "TrainingDiverged", "TrimmedMean",
        "WeightedMean", "align", "checkpoint", "collective", "metrics",
    ]  # fmt: skip
    for name in sl.__all__:
        assert getattr(sl, name) is not None


def test_gradientmails_option_names_are_diloco_fields():
    fields = set(sl.DiLoCo.__dataclass_fields__)
    assert {"sync_every", "fragments", "in_flight", "overlap_steps", "mixing", "merge", "quorum_size", "partition",
            "global_batch_size", "delta_dtype", "commit_dtype", "flush_on_close"} <= fields  # fmt: skip
