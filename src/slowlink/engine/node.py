"""The driver of one node, generic over the method and the channel: it runs the pure round-keeping of
algorithms/rounds.py and does what it says, with the model (through its adapter) and the channel.

Real runs call `step()` from the training thread, whose waits block on the channel; the simulator calls the
same functions inline and parks a waiting worker itself (`waiting()`). Nothing here reads `time`: every
reading and wait goes through the node's clock.
"""

from collections.abc import Callable
from dataclasses import dataclass

from ..algorithms import rounds as rounds_
from ..algorithms.method import Rounds
from ..algorithms.mixing import carry_change, carry_overlap_change
from ..arrays import Arrays
from ..clock import Clock
from ..errors import ConfigError, ContributionRefused
from ..events import Event
from .channel import Arrival, Channel, Contribution, Refused


@dataclass
class Outgoing:
    """The arrays of a contribution in flight: its snapshot, which the channel turns into Δ = anchor −
    snapshot in place as it uploads; once a commit holding it arrives, Δ carries the overlap steps."""

    round: int
    arrays: Arrays
    uploaded: bool = False  # `arrays` holds Δ, and nothing writes it any more
    blob: str | None = None  # the sha256 of its payload, once uploaded, when the channel tells it


class Node:
    def __init__(
        self,
        *,
        node_id: str,
        rounds: Rounds,
        adapter: object,
        plan: list[list[str]],
        channel: Channel,
        clock: Clock,
        latest: dict[int, tuple[int, Arrays]],
        emit: Callable[[Event], None],
    ) -> None:
        self.node_id, self.rounds, self.adapter, self.plan = node_id, rounds, adapter, plan
        self.channel, self.clock, self.emit = channel, clock, emit
        # A device copy where the adapter can make one: the host copy is then the channel's, on its thread.
        self._clone = getattr(adapter, "clone", None)
        if self._clone is not None:
            from .clones import ClonePool  # torch's: only an adapter of torch tensors clones

            self.clones = ClonePool(adapter.tensors, plan, rounds.in_flight)
        self.state = rounds_.start(rounds, [latest[q][0] for q in range(len(plan))])
        self.anchors = dict(latest)  # fragment -> (version, params) of the commit it is aligned with
        self.outgoing: dict[int, Outgoing] = {}
        self.held: list[Arrival] = []  # commits that wait for their τ-th step, in the order they came
        self.step_seconds = 0.0  # moving average of the time between two steps
        self.busy_seconds = 0.0  # spent inside step(), waits included
        self.refusals: dict[int, ContributionRefused] = {}  # fragment -> why the channel did not publish it
        self.flushed: set[int] = set()  # fragments whose final contribution went out as this node left
        self._last_step_at: float | None = None

    # ---- one step ------------------------------------------------------------------------------------

    def step(self, samples: int) -> None:
        now = self.clock.now()
        self.begin_step(samples, now)
        while self.waiting():
            self.wait_for_commit(timeout=0.5)
        self.busy_seconds += self.clock.now() - now
        if self.refusals:  # raised once, after the step is counted: the state is whole, the user may reset()
            refusals, self.refusals = self.refusals, {}
            raise next(iter(refusals.values()))

    def begin_step(self, samples: int, now: float) -> None:
        """Count the step, apply what has arrived, publish what is due; everything but the τ wait."""
        if self._last_step_at is not None:
            elapsed = now - self._last_step_at
            self.step_seconds = elapsed if self.step_seconds == 0 else 0.9 * self.step_seconds + 0.1 * elapsed
        self._last_step_at = now
        self.state = rounds_.advance(self.state, samples)
        self.receive()
        state, due = rounds_.take_due(self.rounds, self.state)
        if due is not rounds_.NOTHING_DUE:
            _refuse_sampleless(state, due.publish)  # before the state takes it: nothing is half-published
            self.state = state
            self._act_on(due)

    def waiting(self) -> bool:
        return rounds_.must_wait(self.rounds, self.state)

    def wait_for_commit(self, timeout: float, *, hold: bool = True) -> None:
        arrival = self.channel.gather(self.clock.now() + timeout)
        if arrival is not None:
            self.apply(arrival, hold=hold)
        elif self.channel.failure is not None:
            raise self.channel.failure

    def receive(self, *, hold: bool = True) -> None:
        if self.held:
            waiting, self.held = self.held, []
            for arrival in waiting:
                self.apply(arrival, hold=hold)
        for arrival in self.channel.arrivals():
            self.apply(arrival, hold=hold)

    def _act_on(self, due: rounds_.Due) -> None:
        for fragment, round_ in due.skipped:
            self.emit(Event("sync_skipped", self.node_id, f"fragment {fragment} round {round_} is already committed; "
                            "its steps go into the next sync", {"fragment": fragment, "round": round_}))  # fmt: skip
        for fragment in due.publish:
            self._publish(fragment, final=False)
        for fragment in due.deferred:
            self.emit(Event("sync_deferred", self.node_id,
                            f"fragment {fragment} is due but its previous contribution is still in flight; it will "
                            "be published as soon as that commits", {"fragment": fragment}))  # fmt: skip

    def _publish(self, fragment: int, *, final: bool) -> None:
        """Snapshot the fragment whose flight the state has just opened and hand it to the channel."""
        flight = self.state.flights[fragment]
        version, anchor = self.anchors[fragment]
        snapshot = self._copy_out(fragment)
        self.outgoing[fragment] = Outgoing(flight.round, snapshot)
        self.channel.publish(Contribution(
            fragment=fragment, step=flight.snapshot_step, base=version, anchor=anchor, snapshot=snapshot,
            steps=flight.steps, samples=flight.samples, final=final, step_seconds=self.step_seconds,
        ))  # fmt: skip

    def _copy_out(self, fragment: int) -> Arrays:
        """The fragment's values for a contribution: a device clone into held buffers (those of settled
        snapshots, which nothing reads once their commit has come: engine/channel.py); a host snapshot
        where the adapter has no device copy."""
        names = self.plan[fragment]
        if self._clone is None:
            return self.adapter.snapshot(names)
        self.clones.release(keep=lambda q: q in self.outgoing)
        return self._clone(names, into=self.clones.take(fragment))

    def _scratch(self):
        """Room for a commit's change, tensor by tensor, in a free clone buffer: applying it allocates nothing."""
        return self.clones.scratch() if self._clone is not None else None

    def sent(self, fragment: int, round_: int, blob: str | None) -> None:
        """The channel's word that the contribution to (fragment, round) is uploaded (any thread)."""
        outgoing = self.outgoing.get(fragment)
        if outgoing is not None and outgoing.round == round_:
            outgoing.uploaded, outgoing.blob = True, blob

    # ---- aligning with a commit (research/algorithms.md §2.3) ----------------------------------------

    def apply(self, arrival: Arrival | Refused, *, hold: bool = True) -> None:
        if isinstance(arrival, Refused):
            self._refused(arrival)
            return
        fragment = arrival.fragment
        if hold and (
            any(other.fragment == fragment for other in self.held)  # commits of a fragment apply in order
            or rounds_.held(self.rounds, self.state, fragment, arrival.version)
        ):
            self.held.append(arrival)
            return
        _, anchor = self.anchors[fragment]
        self.state, alignment = rounds_.arrive(
            self.rounds, self.state, fragment, arrival.version, arrival.mine
        )
        if alignment.rule == "stale":
            return
        if alignment.rule == "carry_overlap":
            # θ ← θ + (Θ_new − θ_snapshot), θ_snapshot = anchor − Δ: the steps trained while the round was in
            # flight stay, on top of the commit, and go into the next contribution. Nothing is lost.
            delta = self.outgoing[fragment].arrays
            self.adapter.shift(carry_overlap_change(anchor, arrival.params, delta, self._scratch()))
        elif alignment.rule == "blend":
            self.adapter.blend(arrival.params, self.rounds.mixing)  # θ ← α·θ + (1−α)·Θ (Streaming DiLoCo)
            if alignment.replaced:
                self.emit(Event("steps_replaced", self.node_id,
                                f"fragment {fragment}: {alignment.replaced} steps trained while round "
                                f"{alignment.settled.round} was in flight were blended with mixing={self.rounds.mixing}",
                                {"steps": alignment.replaced}))  # fmt: skip
        else:  # θ ← θ + (Θ_new − Θ_old): keep every local step; the next contribution carries them
            self.adapter.shift(carry_change(anchor, arrival.params, self._scratch()))
            if (late := alignment.late) is not None and arrival.mine == "rejected":
                self.emit(Event("own_contribution_rejected", self.node_id,
                                f"fragment {fragment} round {late.round} was committed without this node's "
                                f"contribution, which the merger rejected: {arrival.rejected}. Its {late.steps} "
                                "steps go into the next one (if this node's model was changed outside training, "
                                "e.g. by load_state_dict, call session.reset())",
                                {"fragment": fragment, "round": late.round, "steps": late.steps,
                                 "reason": arrival.rejected}))  # fmt: skip
            elif late is not None:
                self.emit(Event("contribution_late", self.node_id,
                                f"fragment {fragment} round {late.round} was committed without this node's "
                                f"contribution; its {late.steps} steps go into the next one",
                                {"fragment": fragment, "round": late.round, "steps": late.steps}))  # fmt: skip
        if alignment.lost:
            why = f"was rejected ({arrival.rejected})" if arrival.mine == "rejected" else "missed its round"
            self.emit(Event("steps_dropped", self.node_id,
                            f"fragment {fragment} round {alignment.settled.round}: the contribution made before "
                            f"session.reset() {why}; its {alignment.lost} steps are no longer in the model",
                            {"steps": alignment.lost}))  # fmt: skip
        if alignment.settled is not None:
            self.outgoing.pop(fragment, None)
        self.anchors[fragment] = (arrival.version, arrival.params)
        self.emit(Event("commit_applied", self.node_id, f"fragment {fragment} now at round {arrival.version}",
                        {"fragment": fragment, "round": arrival.version}))  # fmt: skip

    def _refused(self, refusal: Refused) -> None:
        """The channel did not publish a contribution (its Δ is far outside this node's history): free its
        slot, keep its steps, and raise at the end of the step, naming the fixes."""
        fragment = refusal.fragment
        flight = self.state.flights[fragment]
        if flight is None or flight.round != refusal.round:
            return  # a commit of its round came first and settled it
        self.state, lost = rounds_.refused(self.state, fragment)
        self.outgoing.pop(fragment, None)
        if lost:
            self.emit(Event("steps_dropped", self.node_id,
                            f"fragment {fragment}: the contribution made before session.reset() was not published; "
                            f"its {lost} steps are no longer in the model", {"steps": lost}))  # fmt: skip
            return
        self.refusals[fragment] = ContributionRefused(
            f"fragment {fragment}'s contribution after local step {flight.snapshot_step} was not published: "
            f"{refusal.reason}. The model moved far more than this node's training moves it: if it was "
            "changed outside training (model.load_state_dict, Trainer(resume_from_checkpoint=...)), call "
            "session.reset() after the change, or load before entering the Session; if training moved it this "
            "far (a learning rate raised tenfold), raise the method's max_norm_ratio or set it to None. Its "
            f"{flight.steps} steps are kept for the next sync (session.reset() drops them)"
        )

    def reset(self) -> None:
        """The model was changed outside training: its parameters take the commits this node holds again,
        the steps not yet sent are dropped, and contributions in flight are carried (rounds.reset)."""
        self.state, dropped = rounds_.reset(self.state)
        self.refusals.clear()  # the change they were refused for is gone
        self.adapter.assign(
            {name: values for _, params in self.anchors.values() for name, values in params.items()}
        )
        if dropped:
            self.emit(Event("steps_dropped", self.node_id,
                            f"session.reset(): {dropped} fragment-steps trained since the last sync were dropped "
                            "with the model's change", {"steps": dropped}))  # fmt: skip
        versions = list(self.state.versions)
        in_flight = [(q, flight.round) for q, flight in enumerate(self.state.flights) if flight is not None]
        self.emit(Event("reset", self.node_id,
                        f"the model took the run's commits {versions} again after a change outside training"
                        + (f"; contributions to (fragment, round) {in_flight} are still in flight" if in_flight else ""),
                        {"versions": versions, "steps": dropped}))  # fmt: skip

    # ---- leaving -------------------------------------------------------------------------------------

    def finish(self, close_timeout: float) -> None:
        """Wait for rounds in flight (publishing every pending step first if flush_on_close), then align
        every fragment with its newest commit. Commits waiting for their τ-th step are applied now."""
        deadline = self.clock.now() + close_timeout
        self.receive(hold=False)
        while self.clock.now() < deadline:
            self.flush()
            if self.state.in_flight() == 0:
                break
            self.wait_for_commit(min(0.5, max(0.01, deadline - self.clock.now())), hold=False)
        self.leave()

    def flush(self) -> None:
        """With flush_on_close, publish the steps not yet sent (steps carried by a commit that arrived
        meanwhile go out on the next call), each fragment's final contribution once: one the merger
        rejected or missed comes back unchanged, and sending it again would commit empty rounds until
        close_timeout (its steps are reported dropped)."""
        if self.rounds.flush_on_close:
            for fragment in rounds_.unsent(self.state):
                if fragment in self.refusals or fragment in self.flushed:
                    continue  # refused once already, or sent as final once: its Δ has not changed since
                self.flushed.add(fragment)
                self.state = rounds_.send(self.state, fragment)
                self._publish(fragment, final=True)

    def leave(self) -> None:
        """Apply what has arrived, report the steps no commit holds, and align the model with the newest
        commits."""
        self.receive(hold=False)
        self._report_unmerged()
        self.adapter.assign(
            {name: values for _, params in self.anchors.values() for name, values in params.items()}
        )

    def _report_unmerged(self) -> None:
        dropped = rounds_.dropped_steps(self.state)
        if dropped:
            why = (
                "were never published"
                if self.rounds.flush_on_close
                else "were not merged (set flush_on_close=True to publish them)"
            )
            self.emit(Event("steps_dropped", self.node_id,
                            f"{dropped} fragment-steps trained since the last sync {why}", {"steps": dropped}))  # fmt: skip
        flights = [(q, flight) for q, flight in enumerate(self.state.flights) if flight is not None]
        if flights:  # published: a later commit may still merge them, and its record will say so
            unconfirmed = sum(flight.steps for _, flight in flights)
            rounds = [(q, flight.round) for q, flight in flights]
            self.emit(Event("steps_unconfirmed", self.node_id,
                            f"{unconfirmed} fragment-steps in contributions to (fragment, round) {rounds} were not "
                            "committed before leaving; the run may still merge them",
                            {"steps": unconfirmed, "rounds": rounds}))  # fmt: skip


def _refuse_sampleless(state: rounds_.NodeState, fragments: tuple[int, ...]) -> None:
    """A contribution that reports no samples is rejected by every merger (it has no weight), and a round
    whose contributions are all rejected never commits: refuse it here, at the step that would publish it."""
    for fragment in fragments:
        flight = state.flights[fragment]
        if flight.samples <= 0:
            raise ConfigError(
                f"fragment {fragment}'s contribution would hold {flight.steps} steps that reported 0 samples "
                "between them, and a merger rejects a contribution without samples, so it is not published: "
                "report the samples each step trained on, e.g. session.step(samples=len(batch))"
            )
