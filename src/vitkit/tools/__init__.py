"""The everyday tools, one library function each: evaluate, predict, explain, export, bench; and the
model a tool runs (loading)."""
