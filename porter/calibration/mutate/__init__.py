"""Mutation testing of the specs: operator-level mutants of each unit's known-good source, which the
specs must kill (`porter calibrate --mutate`, docs/mutation.md).

Hand-written mutants are the flaws someone thought of; these are the ones nobody chose, so the share
a spec kills measures what it misses.

    scope.py        where a source may be mutated: its function bodies (tree-sitter), never headers
    operators.py    the operators: each proposes edits at one node of a body
    generate.py     every operator's mutations of a unit (id, location, diff), sampled per operator
    fingerprint.py  an object's machine code as one digest (module ids masked, fatbinary read)
    objects.py      each mutant compiled as the build gate does; did-not-build / equivalent / duplicate
    known_good.py   the known-good source of each unit (scripted answers, a folder, upstream slices)
    declared.py     targets/<t>/equivalent_mutants.toml: reviewed equivalent survivors and why
    runner.py       distinct mutants through parity and perf, the calibration's path
    report.py       outcomes counted per operator and unit, the score, targets/<t>/mutation.json
    command.py      `porter calibrate --mutate`
"""
