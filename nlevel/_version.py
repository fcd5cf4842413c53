"""The package's version, in a module of its own.

Kept out of ``nlevel/__init__.py`` so that modules which record the version (the run
report, the checkpoint's metadata, the calibration file, ``--version``) do not import
the package's ``__init__``, which imports them: no import circle.
"""

__version__ = "0.1.0"
