"""The operators' run page in the admin: what it shows (``layout``: the graph, the time
line, progress, credits, decisions waiting, the live state it polls), drawn as SVG on the
server (``svg``), served with its controls (``view``)."""
