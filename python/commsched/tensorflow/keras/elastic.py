"""commsched.tensorflow.keras.elastic: the elastic API of commsched.keras.elastic (horovod.tensorflow.keras.elastic)."""
from commsched.keras.elastic import *  # noqa: F401,F403
