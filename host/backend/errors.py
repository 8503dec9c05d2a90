"""Errors of the virtio backend, each carrying the wire code the guest is answered with.

`CommandError` becomes an error *response* on the control queue (spec §6, §9): the
guest always gets an answer. `ControlError` becomes an `ok: false` reply on the
control channel (spec §2). Neither ever escapes a session.
"""

from pvgpu.spec import wire


class CommandError(Exception):
    """A device command failed; answered with response type `resp` (RESP_ERR_*)."""

    def __init__(self, resp: int, message: str, info0: int = 0, info1: int = 0):
        super().__init__(message)
        self.resp = resp
        self.message = message
        self.info0 = info0
        self.info1 = info1

    @property
    def name(self) -> str:
        return wire.RESP_NAMES.get(self.resp, hex(self.resp))


class ControlError(Exception):
    """A control message was refused; answered with `{ok: false, error, message}`."""

    def __init__(self, error: str, message: str):
        super().__init__(message)
        self.error = error
        self.message = message
