"""Multi-process serving (`server.workers`): front-end processes beside one engine process per device."""
