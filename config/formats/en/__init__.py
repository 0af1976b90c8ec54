"""The English formats (``formats``): how the admin writes dates and times."""
