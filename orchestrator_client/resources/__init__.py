"""``Client``'s routes by resource, each a class over ``http.HttpClient`` that
``Client`` combines: runs (and their parts and history), schedules, artifacts."""
