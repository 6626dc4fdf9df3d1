"""Where graphs may leave the CPU: deployment targets (``targets``, the ``qnn_configs`` files),
Talker layer placements (``placement``), sessions on the QNN execution provider (``qnn``), the
installed QNN package and its HTP skels (``qnn_package``), HTP graphs in host processes
(``hosts``), fp16 saturation seen at run time (``saturation``), MatMul weights at an HTP precision
(``weights``) and a frame's cost on paper (``cost``). A target is read once, where it enters
(``targets.load_target``, called by the plan and the commands): everything below takes the ``Target``.

May import: ``kztts.core``, ``kztts.bundle``, ``kztts.generation``.
"""
