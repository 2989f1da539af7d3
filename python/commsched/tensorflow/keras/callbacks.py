"""commsched.tensorflow.keras.callbacks: the callbacks of commsched.keras.callbacks."""
from commsched.keras.callbacks import (BestModelCheckpoint, BroadcastGlobalVariablesCallback,  # noqa: F401
                                       LearningRateScheduleCallback, LearningRateWarmupCallback,
                                       MetricAverageCallback)
