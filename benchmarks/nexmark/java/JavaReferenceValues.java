/*
 * The JDK reference values of tests/benchmarks/test_nexmark_generator.py: java.util.Random
 * draws and the Java arithmetic (Math.round, integer / and %) that benchmarks/nexmark/java_random.py
 * reproduces. JDK only, no Beam:
 *
 *     java benchmarks/nexmark/java/JavaReferenceValues.java      (JDK 11+, single-file launch)
 *
 * One value group per line, space separated; lines starting with '#' are comments. The test
 * test_reference_values_program_reproduces_the_java_literals runs this program and compares every
 * line with the literals the other tests use (see README.md in this directory for the mapping).
 */

import java.util.Random;

public final class JavaReferenceValues {

  /** Seeds of the test's _JAVA_RANDOM, in its order (Long.MIN_VALUE and MAX_VALUE included). */
  static final long[] SEEDS = {0L, 1L, 42L, -1L, 123456789L, Long.MIN_VALUE, Long.MAX_VALUE, 99999L};

  /** Bounds of the test's _BOUNDS: nextInt(bound) for each, in one stream. */
  static final int[] BOUNDS = {
    1, 2, 3, 10, 13, 26, 100, 1 << 20, (1 << 30) + 1, Integer.MAX_VALUE
  };

  /** Rejection path: new Random(2024), 1000 x nextInt((1 << 30) + 1). */
  static final long REJECTION_SEED = 2024L;

  static final int REJECTION_BOUND = (1 << 30) + 1;
  static final int REJECTION_DRAWS = 1000;

  /** Math.round arguments. */
  static final double[] ROUND_ARGS = {0.49999999999999994, -2.5, 2.5, -0.5};

  private JavaReferenceValues() {}

  public static void main(String[] args) {
    StringBuilder out = new StringBuilder();
    out.append("# java.util.Random and Java arithmetic on java.version=")
        .append(System.getProperty("java.version"))
        .append('\n');

    // bounds B1 ... B10
    out.append("bounds");
    for (int bound : BOUNDS) {
      out.append(' ').append(bound);
    }
    out.append('\n');

    // seed S nextInt|nextLong|nextDouble|nextIntBounded V1 V2 ...: each from a fresh new Random(S).
    for (long seed : SEEDS) {
      Random r = new Random(seed);
      out.append("seed ").append(seed).append(" nextInt");
      for (int i = 0; i < 4; i++) {
        out.append(' ').append(r.nextInt());
      }
      out.append('\n');

      r = new Random(seed);
      out.append("seed ").append(seed).append(" nextLong");
      for (int i = 0; i < 3; i++) {
        out.append(' ').append(r.nextLong());
      }
      out.append('\n');

      r = new Random(seed);
      out.append("seed ").append(seed).append(" nextDouble");
      for (int i = 0; i < 3; i++) {
        out.append(' ').append(Double.toHexString(r.nextDouble()));
      }
      out.append('\n');

      r = new Random(seed);
      out.append("seed ").append(seed).append(" nextIntBounded");
      for (int bound : BOUNDS) {
        out.append(' ').append(r.nextInt(bound));
      }
      out.append('\n');
    }

    // rejection SEED BOUND DRAWS first8 V1 ... V8 / sum S: about half the draws are rejected.
    Random r = new Random(REJECTION_SEED);
    long sum = 0;
    StringBuilder first8 = new StringBuilder();
    for (int i = 0; i < REJECTION_DRAWS; i++) {
      int value = r.nextInt(REJECTION_BOUND);
      sum += value;
      if (i < 8) {
        first8.append(' ').append(value);
      }
    }
    String rejection =
        "rejection " + REJECTION_SEED + " " + REJECTION_BOUND + " " + REJECTION_DRAWS + " ";
    out.append(rejection).append("first8").append(first8).append('\n');
    out.append(rejection).append("sum ").append(sum).append('\n');

    // freshNextInt SEED BOUND V: new Random(SEED).nextInt(BOUND).
    for (int bound : new int[] {100, 10}) {
      out.append("freshNextInt 42 ")
          .append(bound)
          .append(' ')
          .append(new Random(42L).nextInt(bound))
          .append('\n');
    }

    // round X V: Math.round(X) (X printed by Double.toString, which round-trips).
    for (double x : ROUND_ARGS) {
      out.append("round ").append(x).append(' ').append(Math.round(x)).append('\n');
    }

    // div A B V: A / B;  rem A B V: A % B;  absRem A B V: Math.abs(A % B) (long arithmetic).
    out.append("div -7 2 ").append(-7L / 2L).append('\n');
    out.append("rem -7 26 ").append(-7L % 26L).append('\n');
    out.append("absRem ")
        .append(Long.MIN_VALUE)
        .append(" 10 ")
        .append(Math.abs(Long.MIN_VALUE % 10L))
        .append('\n');

    // maxEventsUnbounded V: GeneratorConfig's maxEvents for numEvents = 0 with the default
    // sizes, Long.MAX_VALUE / (PROPORTION_DENOMINATOR * max(200, 500, 100)).
    out.append("maxEventsUnbounded ").append(Long.MAX_VALUE / (50 * 500)).append('\n');

    System.out.print(out);
    System.out.flush();
  }
}
