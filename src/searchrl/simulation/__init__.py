"""The simulated weeks' library parts: what a simulated week changes in the world (`world`:
gold rows, corpus, the stewards' decisions, injected faults) and the N weeks' table and figure
(`report`). Running a week through the real flow and N weeks with faults (flows/weekly/) sits
above the library, beside the flows it drives; scripts/weeks.py is the thin command line on
top. Retention, which every run applies, is searchrl/retention.py."""
