"""HTTP routes by API family; each module exposes `routes: web.RouteTableDef`."""
