"""The errors services raise; the API turns each into one HTTP status (see `api/app.py`).

    ServiceError            400  bad input; `field` names what was wrong
    ├── Unauthorized        401  no token, or an unknown/revoked one
    ├── Forbidden           403  the token's role or team does not allow it
    ├── NotFound            404
    ├── Conflict            409  not in a state that allows it (e.g. cancel a finished job)
    ├── Unprocessable       422  well-formed, but it names what does not exist elsewhere (an unknown image)
    └── BadGateway          502  a system the plane depends on failed (a registry down, its login refused)
"""

from __future__ import annotations


class ServiceError(Exception):
    status = 400

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.message, self.field = message, field

    def to_dict(self) -> dict[str, str | None]:
        return {"error": self.message, "field": self.field}


class Unauthorized(ServiceError):
    status = 401


class Forbidden(ServiceError):
    status = 403


class NotFound(ServiceError):
    status = 404


class Conflict(ServiceError):
    status = 409


class Unprocessable(ServiceError):
    status = 422


class BadGateway(ServiceError):
    status = 502
