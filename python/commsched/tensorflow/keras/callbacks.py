"""commsched.tensorflow.keras.callbacks: the callbacks of commsched.keras.callbacks."""
from commsched.keras.callbacks import (BroadcastGlobalVariablesCallback, LearningRateWarmupCallback,  # noqa: F401
                                       MetricAverageCallback)
