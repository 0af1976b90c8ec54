"""Every spelling of a reference to the secret ``TOKEN`` that the template parser
accepts, for the tests that a secret is read or refused whatever its spelling: a check
that matched text (``"${secrets." in ...``) let all but the first through."""

from __future__ import annotations

import pytest

SPELLINGS = {
    "dotted": "${secrets.TOKEN}",
    "spaced": "${ secrets.TOKEN }",
    "space-before": "${ secrets.TOKEN}",
    "space-after": "${secrets.TOKEN }",
    "tab-and-newline": "${\tsecrets.TOKEN\n}",
    "unicode-spaces": "${\u00a0secrets.TOKEN\u3000}",
    "double-quoted": '${secrets["TOKEN"]}',
    "single-quoted": "${secrets['TOKEN']}",
    "quoted-and-spaced": "${ secrets['TOKEN'] }",
    "embedded": "Bearer ${ secrets.TOKEN} and more",
    "after-an-escape": "$${kept} then ${secrets['TOKEN']}",
}

# pytest.mark.parametrize("spelling", ...) over every spelling, named.
every_spelling = pytest.mark.parametrize("spelling", list(SPELLINGS.values()), ids=list(SPELLINGS))
