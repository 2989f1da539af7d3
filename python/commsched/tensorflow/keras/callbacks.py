"""commsched.tensorflow.keras.callbacks: the callbacks of commsched.keras.callbacks."""
from commsched.keras.callbacks import (BroadcastGlobalVariablesCallback, LearningRateScheduleCallback,  # noqa: F401
                                       LearningRateWarmupCallback, MetricAverageCallback)
