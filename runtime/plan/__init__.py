"""The one crossroads: the execution plan decides, for a bundle, a target, a placement and a Code
Predictor mode, where every graph of a job runs and why (``resolve``), then opens its sessions and
builds its runners (``execution``); a device bundle holds what the plan of its target opens (``pack``).

May import: ``kztts.core``, ``kztts.bundle``, ``kztts.generation``, ``kztts.htp``, ``kztts.runners``.
"""
