"""Insert many new rows with PostgreSQL's COPY instead of ``bulk_create``.

``bulk_create`` builds one SQL statement per batch, its parameters quoted in Python: for
the 20,000 steps of a wide run that is most of the pick-up's time (the statement is
compiled field by field, then every value quoted into a query of megabytes, all in
memory at once). COPY streams the rows: each is adapted and written as it is produced,
so neither the rows nor a statement are ever held whole, and memory stays flat however
wide the run. It suits rows whose primary key the database assigns and that nobody needs
back as instances; it runs in the caller's transaction, so PgBouncer in transaction mode
is fine with it.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import DEFAULT_DB_ALIAS, connections, models


def copy_insert(model: type[models.Model], objs: Iterable[models.Model]) -> int:
    """Insert ``objs`` (unsaved instances of ``model``) with COPY; return how many.

    Each value is prepared as ``save()`` would prepare it (``pre_save`` fills the
    ``auto_now_add`` timestamps, ``get_db_prep_save`` adapts JSON and decimals); the
    auto-incremented primary key is left to the database.
    """
    fields = [
        field
        for field in model._meta.concrete_fields
        if not (field.primary_key and isinstance(field, models.AutoField | models.BigAutoField))
    ]
    # The connection itself, not django.db.connection: that proxy resolves the thread's
    # connection on every attribute, and a value is prepared per field per row.
    connection = connections[DEFAULT_DB_ALIAS]
    columns = ", ".join(connection.ops.quote_name(field.column or field.name) for field in fields)
    table = connection.ops.quote_name(model._meta.db_table)
    count = 0
    with (
        connection.cursor() as cursor,
        cursor.cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy,
    ):
        for obj in objs:
            copy.write_row(
                [field.get_db_prep_save(field.pre_save(obj, True), connection) for field in fields]
            )
            count += 1
    return count
