"""The Spark launcher's conf, without Spark: the JVM setup a run's label names."""

import subprocess
import sys

from tests.sparkcluster import render_spark_defaults, role_defaults
from trainer.launchers._spark import jvm_label

# What Spark 4 itself puts in spark.executor.extraJavaOptions (read back from a session with no JVM
# options set): Java module access, not a setup.
SPARKS_OWN = ("-Djava.net.preferIPv6Addresses=false -XX:+IgnoreUnrecognizedVMOptions "
              "--add-modules=jdk.incubator.vector --add-opens=java.base/java.lang=ALL-UNNAMED "
              "-Dio.netty.tryReflectionSetAccessible=true --enable-native-access=ALL-UNNAMED")


def test_the_label_names_the_jvm_options_and_leaves_sparks_own_out():
    assert jvm_label({}) == ""
    assert jvm_label({"spark.executor.extraJavaOptions": SPARKS_OWN}) == ""
    tuned = {"spark.executor.extraJavaOptions": f"{SPARKS_OWN} -XX:TieredStopAtLevel=1 -XX:+UseSerialGC"}
    assert jvm_label(tuned) == " + JVM -XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def test_the_roles_jvm_options_go_to_the_driver_and_the_executors_or_nowhere():
    options = role_defaults()["spark_jvm_options"]
    lines = render_spark_defaults(7077, None, {}).splitlines()
    assert f"spark.driver.extraJavaOptions        {options}" in lines
    assert f"spark.executor.extraJavaOptions      {options}" in lines
    # "" keeps the JVM's defaults: no line at all.
    assert "extraJavaOptions" not in render_spark_defaults(7077, None, {}, spark_jvm_options="")


def test_the_training_processes_module_imports_no_pyspark():
    """TorchDistributor pickles train_on_executor by reference: every training process imports its module
    before it trains, so that module must not pull in pyspark (the launcher's own imports take 0.9 s)."""
    probe = ("import sys, trainer.launchers._spark as m; assert m.train_on_executor; "
             "print(sorted(name for name in sys.modules if name.split('.')[0] in ('pyspark', 'torch')))")
    imported = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip() == "[]"
