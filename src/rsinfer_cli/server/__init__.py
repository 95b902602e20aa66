"""The aiohttp daemon: a pure app factory, routes by API family, one error→HTTP mapping, metrics."""
