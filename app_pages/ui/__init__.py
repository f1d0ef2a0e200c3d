"""What pages are built from: the sidebar, state kept in the session and the URL, caches, pickers, exports.

Each module has one job, so a new page imports the few it needs and no shared file grows with it.
"""
