/*
 * Dumps the events of Beam's Java NEXMark generator in the line format of
 * tests/benchmarks/test_nexmark_generator.py (`_line`), their SHA-256, and the rate-shape
 * values that test marks "Java". It calls only the public API of the published artifact
 * org.apache.beam:beam-sdks-java-testing-nexmark (Maven Central); see README.md in this
 * directory for how to get it and run this program.
 *
 * The events come out as Java's BoundedEventSource makes them:
 * new GeneratorConfig(config, BASE_TIME, 0, numEvents, 0).split(numEventGenerators), one
 * Generator per part, the parts concatenated; the position of an event is its index in that
 * concatenation.
 *
 * Usage (CONFIG is DEFAULT, JAGGED or SINGLE, the configurations of the test, optionally with
 * NexmarkConfiguration field overrides: JAGGED or DEFAULT:numEvents=0,rateShape=SINE,...):
 *
 *   NexmarkDump golden                      every generator literal of the test (README.md)
 *   NexmarkDump lines CONFIG [START [STOP]] the dump lines of positions [START, STOP)
 *   NexmarkDump sha CONFIG START STOP       SHA-256 of those lines, each ending in '\n'
 */

import java.io.BufferedWriter;
import java.io.IOException;
import java.io.OutputStreamWriter;
import java.io.Writer;
import java.lang.reflect.Field;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.List;
import org.apache.beam.sdk.nexmark.NexmarkConfiguration;
import org.apache.beam.sdk.nexmark.NexmarkUtils.RateShape;
import org.apache.beam.sdk.nexmark.NexmarkUtils.RateUnit;
import org.apache.beam.sdk.nexmark.model.Auction;
import org.apache.beam.sdk.nexmark.model.Bid;
import org.apache.beam.sdk.nexmark.model.Event;
import org.apache.beam.sdk.nexmark.model.Person;
import org.apache.beam.sdk.nexmark.sources.generator.Generator;
import org.apache.beam.sdk.nexmark.sources.generator.GeneratorConfig;
import org.joda.time.Instant;

public final class NexmarkDump {

  /** NexmarkUtils.BASE_TIME (private there): the event time of the first event. */
  static final long BASE_TIME = Instant.parse("2015-07-15T00:00:00.000Z").getMillis();

  private NexmarkDump() {}

  /** Receives the dump lines of consecutive positions. */
  interface LineSink {
    void accept(String line) throws IOException;
  }

  /**
   * The test's configurations. The Python NexmarkConfig defaults to rateShape SQUARE (Java:
   * SINE); with firstEventRate == nextEventRate both give the same single delay, hence the same
   * events, but SQUARE is set so that overriding only the rates gives the Python shape.
   */
  static NexmarkConfiguration config(String spec) {
    int colon = spec.indexOf(':');
    String name = colon < 0 ? spec : spec.substring(0, colon);
    NexmarkConfiguration c = NexmarkConfiguration.DEFAULT.copy();
    c.rateShape = RateShape.SQUARE;
    switch (name) {
      case "DEFAULT":
        break;
      case "JAGGED":
        c.numEvents = 30_000;
        c.numEventGenerators = 3;
        c.outOfOrderGroupSize = 6;
        c.rateShape = RateShape.SQUARE;
        c.firstEventRate = 10_000;
        c.nextEventRate = 2_000;
        c.ratePeriodSec = 4;
        break;
      case "SINGLE":
        c.numEventGenerators = 1;
        c.numEvents = 5_000;
        break;
      default:
        throw new IllegalArgumentException("unknown configuration " + name);
    }
    if (colon >= 0 && colon + 1 < spec.length()) {
      for (String assignment : spec.substring(colon + 1).split(",")) {
        int eq = assignment.indexOf('=');
        if (eq < 0) {
          throw new IllegalArgumentException("expected field=value: " + assignment);
        }
        set(c, assignment.substring(0, eq).trim(), assignment.substring(eq + 1).trim());
      }
    }
    return c;
  }

  /** Sets a public field of NexmarkConfiguration by its Java name. */
  @SuppressWarnings({"unchecked", "rawtypes"})
  static void set(NexmarkConfiguration c, String field, String value) {
    try {
      Field f = NexmarkConfiguration.class.getField(field);
      Class<?> type = f.getType();
      if (type == int.class) {
        f.setInt(c, Integer.parseInt(value));
      } else if (type == long.class) {
        f.setLong(c, Long.parseLong(value));
      } else if (type == double.class) {
        f.setDouble(c, Double.parseDouble(value));
      } else if (type == boolean.class) {
        f.setBoolean(c, Boolean.parseBoolean(value));
      } else if (type.isEnum()) {
        f.set(c, Enum.valueOf((Class<Enum>) type, value));
      } else if (type == String.class) {
        f.set(c, value);
      } else {
        throw new IllegalArgumentException("cannot set " + field + " of type " + type);
      }
    } catch (NoSuchFieldException | IllegalAccessException e) {
      throw new IllegalArgumentException("no settable NexmarkConfiguration field " + field, e);
    }
  }

  /** The generator configurations of the parallel timelines, as BoundedEventSource splits. */
  static List<GeneratorConfig> parts(NexmarkConfiguration c) {
    return new GeneratorConfig(c, BASE_TIME, 0, c.numEvents, 0).split(c.numEventGenerators);
  }

  /** Events in all parts: numEvents, or GeneratorConfig's bound when numEvents is 0. */
  static long totalEvents(NexmarkConfiguration c) {
    long total = 0;
    for (GeneratorConfig part : parts(c)) {
      total += part.maxEvents;
    }
    return total;
  }

  /** Feeds the dump lines of positions [start, stop) to sink, in position order. */
  static void dump(NexmarkConfiguration c, long start, long stop, LineSink sink)
      throws IOException {
    List<GeneratorConfig> parts = parts(c);
    long position = 0;
    for (int index = 0; index < parts.size() && position < stop; index++) {
      GeneratorConfig part = parts.get(index);
      if (position + part.maxEvents <= start) {
        position += part.maxEvents; // a timeline before start: independent of the others
        continue;
      }
      Generator generator = new Generator(part);
      // Generator's wallclock base time is System.currentTimeMillis() at its first event and
      // wallclockTimestamp = base + (event time of the event number - baseTime): recover the
      // base from the first event to print the (deterministic) offset.
      long firstEventTime =
          part.timestampAndInterEventDelayUsForEvent(part.nextEventNumber(0)).getKey();
      long wallclockBase = 0;
      boolean first = true;
      while (generator.hasNext() && position < stop) {
        long eventId = generator.getNextEventId();
        Generator.NextEvent next = generator.nextEvent();
        if (first) {
          wallclockBase = next.wallclockTimestamp - (firstEventTime - part.baseTime);
          first = false;
        }
        if (position >= start) {
          sink.accept(line(position, eventId, index, next, next.wallclockTimestamp - wallclockBase));
        }
        position++;
      }
    }
  }

  /** The test's `_line`: position|eventId|generator|timestamp|wallclock offset|watermark|body. */
  static String line(
      long position, long eventId, int generatorIndex, Generator.NextEvent next, long offsetMs) {
    StringBuilder sb = new StringBuilder();
    sb.append(position).append('|').append(eventId).append('|').append(generatorIndex);
    sb.append('|').append(next.eventTimestamp).append('|').append(offsetMs);
    sb.append('|').append(next.watermark).append('|');
    Event event = next.event;
    if (event.newPerson != null) {
      Person p = event.newPerson;
      join(sb, "P", p.id, p.name, p.emailAddress, p.creditCard, p.city, p.state,
          p.dateTime.getMillis(), p.extra);
    } else if (event.newAuction != null) {
      Auction a = event.newAuction;
      join(sb, "A", a.id, a.itemName, a.description, a.initialBid, a.reserve,
          a.dateTime.getMillis(), a.expires.getMillis(), a.seller, a.category, a.extra);
    } else {
      Bid b = event.bid;
      join(sb, "B", b.auction, b.bidder, b.price, b.dateTime.getMillis(), b.extra);
    }
    return sb.toString();
  }

  private static void join(StringBuilder sb, Object... values) {
    for (int i = 0; i < values.length; i++) {
      if (i > 0) {
        sb.append('|');
      }
      sb.append(values[i]);
    }
  }

  /** SHA-256 (hex) of the dump lines of [start, stop), each followed by '\n'. */
  static String sha(NexmarkConfiguration c, long start, long stop) throws IOException {
    MessageDigest digest;
    try {
      digest = MessageDigest.getInstance("SHA-256");
    } catch (NoSuchAlgorithmException e) {
      throw new IllegalStateException(e);
    }
    MessageDigest d = digest;
    dump(c, start, stop, l -> d.update((l + "\n").getBytes(StandardCharsets.UTF_8)));
    StringBuilder hex = new StringBuilder();
    for (byte b : digest.digest()) {
      hex.append(String.format("%02x", b));
    }
    return hex.toString();
  }

  /** The single dump line of a position. */
  static String lineAt(NexmarkConfiguration c, long position) throws IOException {
    StringBuilder out = new StringBuilder();
    dump(c, position, position + 1, out::append);
    return out.toString();
  }

  static String delays(RateShape shape, int first, int next, RateUnit unit, int generators) {
    StringBuilder sb = new StringBuilder();
    sb.append("interEventDelayUs ").append(shape).append(' ').append(first).append(' ');
    sb.append(next).append(' ').append(unit).append(' ').append(generators);
    for (long delay : shape.interEventDelayUs(first, next, unit, generators)) {
      sb.append(' ').append(delay);
    }
    return sb.toString();
  }

  /** Every generator value the test marks "Java", one per line (README.md maps them). */
  static void golden(Writer out) throws IOException {
    String[][] shaRanges = {
      {"DEFAULT", "0", "2000"}, {"DEFAULT", "99000", "100000"}, {"JAGGED", "9000", "11000"},
    };
    for (String[] r : shaRanges) {
      long start = Long.parseLong(r[1]);
      long stop = Long.parseLong(r[2]);
      out.write("sha " + r[0] + " " + start + " " + stop + " " + sha(config(r[0]), start, stop));
      out.write('\n');
    }
    String[][] lines = {
      {"DEFAULT", "0"}, {"DEFAULT", "1"}, {"DEFAULT", "4"}, {"DEFAULT", "1000"},
      {"DEFAULT", "99999"}, {"JAGGED", "9997"}, {"JAGGED", "9998"}, {"JAGGED", "19990"},
    };
    for (String[] l : lines) {
      out.write("line " + l[0] + " " + l[1] + " " + lineAt(config(l[0]), Long.parseLong(l[1])));
      out.write('\n');
    }
    out.write(delays(RateShape.SINE, 10_000, 1_000, RateUnit.PER_SECOND, 1) + "\n");
    out.write(delays(RateShape.SINE, 777, 12_345, RateUnit.PER_MINUTE, 3) + "\n");
    out.write(delays(RateShape.SQUARE, 10_000, 2_000, RateUnit.PER_SECOND, 3) + "\n");
    out.write("stepLengthSec SINE 600 " + RateShape.SINE.stepLengthSec(600) + "\n");
    out.write("stepLengthSec SQUARE 7 " + RateShape.SQUARE.stepLengthSec(7) + "\n");
    NexmarkConfiguration unbounded = config("DEFAULT:numEvents=0");
    out.write("maxEvents DEFAULT:numEvents=0 "
        + new GeneratorConfig(unbounded, BASE_TIME, 0, unbounded.numEvents, 0).maxEvents + "\n");
  }

  public static void main(String[] args) throws IOException {
    Writer out =
        new BufferedWriter(new OutputStreamWriter(System.out, StandardCharsets.UTF_8), 1 << 16);
    String mode = args.length == 0 ? "" : args[0];
    switch (mode) {
      case "golden":
        golden(out);
        break;
      case "lines":
        {
          if (args.length < 2) {
            usage();
          }
          NexmarkConfiguration c = config(args[1]);
          long start = args.length > 2 ? Long.parseLong(args[2]) : 0;
          long stop = args.length > 3 ? Long.parseLong(args[3]) : totalEvents(c);
          dump(c, start, stop, l -> {
            out.write(l);
            out.write('\n');
          });
          break;
        }
      case "sha":
        {
          if (args.length != 4) {
            usage();
          }
          long start = Long.parseLong(args[2]);
          long stop = Long.parseLong(args[3]);
          out.write(sha(config(args[1]), start, stop) + "\n");
          break;
        }
      default:
        usage();
    }
    out.flush();
  }

  private static void usage() {
    System.err.println(
        "usage: NexmarkDump golden | lines CONFIG [START [STOP]] | sha CONFIG START STOP\n"
            + "  CONFIG: DEFAULT, JAGGED or SINGLE[:field=value,...] (NexmarkConfiguration fields)");
    System.exit(2);
  }
}
