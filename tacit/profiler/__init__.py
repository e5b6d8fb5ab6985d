"""`tacit profile`: where an engine step's time goes, per step kind, layer and operator class.

categories (what an operator class is and which module or C++ phase counts as which), collect
(real engine steps timed by module hooks and the fused decoder's own phase timers), roofline
(FLOPs and bytes per class from the model's shapes; the machine's roofs), summary (steps ->
medians, jitter, per-layer tables, the communication and predicted sections), compare (two
earlier profiles before and after: `--compare A B`), svg and html_report (one self-contained
report.html, for a profile or a comparison), cli (the subcommand).
"""
