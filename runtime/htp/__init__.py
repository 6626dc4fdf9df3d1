"""Where graphs may leave the CPU: deployment targets (``targets``, the ``qnn_configs`` files),
Talker layer placements (``placement``), sessions on the QNN execution provider (``qnn``), the
installed QNN package and its HTP skels (``qnn_package``), HTP graphs in host processes
(``hosts``), fp16 saturation seen at run time (``saturation``) and a frame's cost on paper (``cost``).

May import: ``kztts.core``, ``kztts.bundle``, ``kztts.generation``.
"""
