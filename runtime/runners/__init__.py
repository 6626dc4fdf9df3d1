"""What runs a graph: the Talker runners (one API, ``protocol.TalkerRunner``: CPU ``talker``,
``talker_static``, ``talker_prefill_only``, ``talker_handover``, ``talker_segmented``; a hybrid LM's ``hybrid`` on the
CPU and ``hybrid_static`` on the HTP, with the handover), the batched
runners (``batched``), their KV buffers (``kv_cache``, ``kv_binding``) and rotary tables (``rope``),
the Code Predictor (``code_predictor``), the speech codec (``codec``) and the speaker encoder
(``speaker``). Runners never choose a device: ``kztts.plan`` hands them their sessions.

May import: ``kztts.core``, ``kztts.bundle``, ``kztts.generation``, ``kztts.htp``.
"""
