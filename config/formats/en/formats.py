"""How the admin writes dates and times (FORMAT_MODULE_PATH): ISO-like, 24 h, each time
with its zone (``2026-11-27 21:24:06 UTC``), never a bare ``9:24 p.m.`` a reader must
guess the zone of. Django's own English formats give the rest."""

DATE_FORMAT = "Y-m-d"
TIME_FORMAT = "H:i:s"
DATETIME_FORMAT = "Y-m-d H:i:s T"
SHORT_DATE_FORMAT = "Y-m-d"
SHORT_DATETIME_FORMAT = "Y-m-d H:i T"
