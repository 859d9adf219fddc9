import os

import django
import pytest

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")
django.setup()


@pytest.fixture(autouse=True, scope="session")
def tables() -> None:
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
