"""The shop's Django settings: PostgreSQL through psycopg 3 (Django's ``postgresql``
backend uses it when it is installed), at ``SHOP_DATABASE_URL``."""

import os

from psycopg.conninfo import conninfo_to_dict

database = conninfo_to_dict(os.environ.get("SHOP_DATABASE_URL", "postgresql://localhost/shop"))

SECRET_KEY = "not-a-secret: this example serves nothing"
USE_TZ = True
INSTALLED_APPS = ["orders"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": database.get("dbname", ""),
        "USER": database.get("user", ""),
        "PASSWORD": database.get("password", ""),
        "HOST": database.get("host", ""),
        "PORT": database.get("port", ""),
        "OPTIONS": {"options": database["options"]} if "options" in database else {},
    }
}
