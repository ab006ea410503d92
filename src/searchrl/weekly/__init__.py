"""The weekly loop's library parts: what a week changes in the world (`world`), what is kept
from week to week (`retention`), the figures (`report`). One week run through the real flow and
N weeks with faults (flows/weekly/) sit above the library, beside the flows they drive;
scripts/weeks.py is the thin command line on top."""
