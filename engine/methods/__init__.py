"""Methods that propose tokens: the registry (registry.py, one entry per method with its
lifecycle), the proposer interface and its declared capabilities (proposal.py), and the
proposers: echo and n-gram, the draft model, the drafter, MTP.

Imports the rooms below it (machine, model, kv) and the base modules."""
