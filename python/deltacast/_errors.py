"""deltacast.Error: every failure of the binding, the C library's and its own checks alike."""

from __future__ import annotations

# dc_status (deltacast.h): name -> value.
STATUS = {
    "DC_OK": 0,
    "DC_PENDING": 1,
    "DC_ERR_INVALID_ARGUMENT": -1,
    "DC_ERR_STATE": -2,
    "DC_ERR_UNSUPPORTED": -3,
    "DC_ERR_CONFIG": -4,
    "DC_ERR_NOT_FOUND": -5,
    "DC_ERR_CONNECTION": -6,
    "DC_ERR_TIMEOUT": -7,
    "DC_ERR_AUTH": -8,
    "DC_ERR_CORRUPT": -9,
    "DC_ERR_VERSION_MISMATCH": -10,
    "DC_ERR_VERIFY_FAILED": -11,
    "DC_ERR_REPLAYED": -12,
    "DC_ERR_ABORTED": -13,
    "DC_ERR_IO": -14,
    "DC_ERR_CANCELLED": -15,
    "DC_ERR_NO_MEMORY": -16,
    "DC_ERR_INTERNAL": -17,
}
STATUS_NAMES = {value: name for name, value in STATUS.items()}


def status_name(status: int) -> str:
    return STATUS_NAMES.get(status, "DC_UNKNOWN_STATUS")


class Error(Exception):
    """A failed deltacast call.

    status:      the dc_status value (int, negative), e.g. -7
    status_name: its name, e.g. "DC_ERR_TIMEOUT"
    message:     dc_last_error() of the failing call, or the binding's own explanation when it
                 refused the arguments before calling C
    report:      the producer's report (a dict) when a version was aborted, else None
    """

    def __init__(self, status_name: str, message: str, status=None, report=None):
        if status is None:
            status = STATUS.get(status_name, -17)
        super().__init__(status_name, message)
        self.status = int(status)
        self.status_name = status_name
        self.message = message
        self.report = report

    def __str__(self):
        return f"{self.status_name}: {self.message}"

    def __reduce__(self):  # picklable (multiprocessing passes errors between processes)
        return (Error, (self.status_name, self.message, self.status, self.report))
