"""Calibration: a parity spec is trusted only after it accepted known-good code and
refused each of its mutants by the check named for it (DESIGN.md).

    mutants.py     the one mutant type: a whole candidate file, or named search/replace
                   rules applied to a known-good source; loaded from adversarial/manifest.toml,
                   the scripted bad answers and mutants.toml
    libraries.py   the one library builder: known-good and mutant backends from unit sources
                   (the build gate's way), from the target's upstream checkout, or prebuilt
    calibrator.py  runs every spec against them and appends "calibration" records
    command.py     `porter calibrate`

A spec is "calibrated" only when its known-good passed and it has mutants, each
rejected by its named check; the parity gate and perf read that through
porter.records.history, never from this package.
"""
