"""Date and time formats for the admin's pages, by language (``FORMAT_MODULE_PATH``)."""
