"""Which Talker runner serves a target and a layer placement."""
from __future__ import annotations

from kztts.placement import LayerPlacement, resolve_placement
from kztts.talker import DEFAULT_CONTEXT, Talker, cpu_talker_session


def open_talker(bundle, *, target=None, placement: "str | LayerPlacement | None" = None, strict: bool = False,
                context: int = DEFAULT_CONTEXT):
    """The Talker runner for ``bundle``.

    Without a placement: the target's (``talker_decode`` on the HTP: the static graphs),
    else the CPU graph. With one (``kztts.placement``): everything on the CPU -> the CPU
    graph; everything on the HTP -> the static graphs; prefill on the HTP and decode on
    the CPU -> the KV handover; anything split by layer -> the layer segments."""
    m = bundle.manifest
    cpu_context = min(context, int(m.talker["max_positions"]))
    if placement is None:
        if target is not None and target.on_htp("talker_decode"):
            from kztts.talker_static import StaticTalker

            return StaticTalker.from_bundle(bundle, target, strict)
        return Talker(cpu_talker_session(bundle), m.talker, context=cpu_context)
    placement = resolve_placement(placement, int(m.talker["num_layers"]))
    pre, dec = placement.uniform("prefill"), placement.uniform("decode")
    if pre == dec == "cpu":
        return Talker(cpu_talker_session(bundle), m.talker, context=cpu_context)
    if pre == dec == "htp":
        from kztts.talker_static import StaticTalker

        return StaticTalker.from_bundle(bundle, target, strict)
    if pre == "htp" and dec == "cpu":
        from kztts.talker_handover import HandoverTalker

        return HandoverTalker.from_bundle(bundle, target, strict)
    from kztts.talker_segmented import SegmentedTalker

    return SegmentedTalker.from_bundle(bundle, placement, target, strict)
