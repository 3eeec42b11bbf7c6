"""`porter optimize`: a verified unit made faster with proof -- its profile, the A/B timing of
the committed and the new file, and the speedup verdict."""
