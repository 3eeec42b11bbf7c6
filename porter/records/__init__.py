"""What porter knows and how it proves it: the signed ledger and its witness, the history read from
it, evidence files, git, and the durable writes and locks under them."""
