"""`porter trust [FINGERPRINT]`: pin the signing key a reviewer trusts.

With a pin, a workspace whose ledger/signer.pub names another key (swapped in
the repository, with every record re-signed by the swapper) is tampered. The
pins live in $PORTER_HOME/trusted_keys (one fingerprint a line) and in
$PORTER_TRUSTED_KEYS; without a fingerprint the command prints the workspace's
key and the pins.
"""

from __future__ import annotations

from pathlib import Path

from porter.records import signing


def add_arguments(parser) -> None:
    parser.add_argument("fingerprint", nargs="?", metavar="FINGERPRINT",
                        help="SHA256:... as `porter status` or `ssh-keygen -l -f ledger/signer.pub` prints it")


def run(args) -> int:
    fp = getattr(args, "fingerprint", None)
    if fp:
        added = signing.trust(fp)
        print(f"porter: {'now trusting' if added else 'already trusted'}: {fp} ({signing.trusted_path()})")
        return 0
    public, problem = signing.load_workspace_key(Path(args.workspace))
    print(f"workspace key: {problem or (signing.fingerprint(public) if public else 'none (ledger unsigned)')}")
    pins = sorted(signing.trusted())
    print(f"trusted keys: {', '.join(pins) if pins else 'none pinned (the workspace key is taken as found)'}")
    return 0
