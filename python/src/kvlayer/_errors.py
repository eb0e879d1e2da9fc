"""kvlayer.Error: every refusal, I/O failure and CUDA failure of kvlayer, from C++ or Python.

The C++ library's kvlayer::Error arrives as this class with the library's exact message and its
kind; the package's own refusals (a tensor of the wrong shape, dtype or device) raise it too.
This module imports nothing of the package: the extension looks the class up while the package
is still importing.
"""


class Error(RuntimeError):
    """A kvlayer refusal or failure.

    ``kind`` says coarsely what went wrong; the message says exactly what, starting with the
    operation and naming the offending values and the limit:

    * ``"refused"``: a request refused before any work; the layer is exactly as it was;
    * ``"device"``: a CUDA failure (``"<call>: <CUDA error string>"``);
    * ``"io"``: a snapshot file that cannot be read or written, or is malformed;
    * ``"unavailable"``: the CUDA layer cannot be used here (built without CUDA, or no GPU).
    """

    def __init__(self, message, kind="refused"):
        super().__init__(message)
        self.kind = kind

    def __reduce__(self):
        return (type(self), (str(self), self.kind))
