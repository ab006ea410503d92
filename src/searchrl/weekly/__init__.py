"""The weekly loop as library functions: what a week changes in the world (`world`), one week
run through the real flow and what it left (`week`), N weeks with faults and figures
(`simulate`), and what is kept from week to week (`retention`). scripts/weeks.py is the thin
command line on top."""
