"""A source's measured span acceptance, as a survival curve (Kaplan-Meier with shrinkage): what
the span policy (span_policy.py) prices every span by."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from itertools import islice


@dataclass
class AcceptanceStats:
    """Measured acceptance of one source's spans as a survival curve S(i): the chance that the
    first i tokens of a span are all accepted. Measured, not the proposer's own estimate: a
    suffix tree's frequencies over one prompt are poorly calibrated (a continuation seen once is
    "certain"). A curve, not one per-token rate: copied text is accepted whole or fails at once.

    Kaplan-Meier over tried tokens: position j is at risk in a span proposed longer than j whose
    first j tokens were accepted, and fails there when token j is rejected; shorter spans are
    censored. The first token keeps its own hazard (is the source right here at all?); later
    positions are shrunk towards the pooled hazard of all later positions, which also prices
    positions no span has reached yet, so spans can grow past what the cut has tried so far.
    The prior is one pseudo-span: its first token accepted with chance prior_first (the
    policy sets it from the source's match length, Source.prior), later ones with
    prior_rate each: 0.65, the acceptance of a token after right ones pooled over every span of
    the development traces (`ssr traces`, GPU preset, cold: 52% after one right token, 61%
    after two, 71% after four, 83% after eight; copied text, once right, tends to stay right).
    A prior of 0.9 priced spans too long: at the positions no span had reached it predicted
    1.5-7x the acceptance later measured there. A source is tried where its prior pays on this
    engine and learnt within a few passes (the guard bounds the cost). Older spans weigh less
    (`decay` per span): text moves between copied and new regions, and a source that just
    failed at once is likely to fail at the next position too."""

    prior_weight: float = 1.0  # pseudo-spans behind the prior
    prior_first: float = 0.9  # the prior's chance that the span's first token is accepted
    prior_rate: float = 0.65  # the prior's chance to accept each later token given the ones before
    decay: float = 0.9  # weight of the spans seen so far when a new one is observed
    # the counts, decayed lazily: a count is its units x `unit`; a new span shrinks `unit` by
    # `decay` (every earlier span weighs less at once) and adds 1 / unit to the positions it
    # tried, so an observation costs O(tokens tried), not O(positions ever tried)
    risk_units: list[float] = field(default_factory=list)  # [j]: spans that tried token j, in units
    fail_units: list[float] = field(default_factory=list)  # [j]: of those, rejected token j, in units
    tail_risk_units: float = 0.0  # sum of risk_units[1:]
    tail_fail_units: float = 0.0  # sum of fail_units[1:]
    unit: float = 1.0  # what one unit counts now

    @property
    def at_risk(self) -> list[float]:
        """[j]: spans that tried token j (decayed)."""
        return [count * self.unit for count in self.risk_units]

    @property
    def failed(self) -> list[float]:
        """[j]: spans that tried token j and had it rejected (decayed)."""
        return [count * self.unit for count in self.fail_units]

    def observe(self, num_proposed: int, num_accepted: int) -> None:
        self.__dict__.pop("_curve", None)  # the curve changes
        tried = min(num_proposed, num_accepted + 1)
        self.unit *= self.decay
        if self.unit < 1e-200:  # units this large lose nothing yet; fold them back before they overflow
            self._fold()
        add, risk, fail = 1.0 / self.unit, self.risk_units, self.fail_units
        if tried > len(risk):
            risk.extend([0.0] * (tried - len(risk)))
            fail.extend([0.0] * (tried - len(fail)))
        for j in range(tried):
            risk[j] += add
        self.tail_risk_units += add * max(0, tried - 1)
        if num_accepted < num_proposed:
            fail[num_accepted] += add
            if num_accepted:
                self.tail_fail_units += add

    def _fold(self) -> None:
        """The units times `unit`, and `unit` back to 1 (the counts are unchanged)."""
        self.risk_units, self.fail_units = self.at_risk, self.failed
        self.tail_risk_units, self.tail_fail_units = sum(self.risk_units[1:]), sum(self.fail_units[1:])
        self.unit = 1.0

    def carried(self, weight: float) -> AcceptanceStats:
        """A copy whose spans weigh `weight` as much: what the next request starts from (the prior
        regains ground, so a source that failed in earlier requests is tried again later)."""
        return replace(self, risk_units=list(self.risk_units), fail_units=list(self.fail_units),
                       unit=self.unit * weight)

    def probs(self, length: int) -> list[float]:
        """S(1) .. S(length), from a curve computed once per observation (every candidate of a pass
        is priced on it)."""
        return self.curve(length)[:length]

    def curve(self, length: int) -> list[float]:
        """The curve itself, S(1) .. S(length) and maybe more: the caller reads it, never changes it."""
        curve = self.__dict__.get("_curve")
        if curve is None or len(curve) < length:
            curve = self._curve = self._survival(length)
        return curve

    def survivals(self) -> Iterator[float]:
        """S(1), S(2), ... without end, made as they are read (a lone candidate's cut reads a few:
        SpanPolicy._choose_one): Kaplan-Meier with shrinkage (the class docstring). Positions no
        span tried yet take the shrunk hazard itself (what the formula gives them)."""
        weight, unit = self.prior_weight, self.unit
        first_hazard = 1.0 - self.prior_first
        at_risk, failed = self.risk_units, self.fail_units  # in units
        pooled = (self.tail_fail_units * unit + weight * (1.0 - self.prior_rate)) / (self.tail_risk_units * unit + weight)
        if at_risk:
            survival = 1.0 - (failed[0] * unit + weight * first_hazard) / (at_risk[0] * unit + weight)
            yield survival
            shrunk = weight * pooled
            for risk, fail in zip(at_risk[1:], failed[1:]):
                survival *= 1.0 - (fail * unit + shrunk) / (risk * unit + weight)
                yield survival
            survival *= 1.0 - pooled
        else:
            survival = 1.0 * (1.0 - first_hazard)
        yield survival
        step = 1.0 - pooled
        while True:  # untried positions
            survival *= step
            yield survival

    def _survival(self, length: int) -> list[float]:
        """S(1) .. S(length) as a list (survivals)."""
        return list(islice(self.survivals(), length))
