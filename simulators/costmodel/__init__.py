"""The cost model: durations from hardware and model specs instead of hand-set knobs.

``hardware.py`` holds GPU presets, ``models.py`` model presets, ``formulas.py`` the
formulas (each written once, with its source), and ``derive.py`` fills a scenario mapping's
absent cost fields from them before validation, so an explicit number always wins.
"""
